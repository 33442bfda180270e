segtape_test(agent_test SOURCES agent_test.cpp LABELS agent LIBS segtape_agent)
target_compile_definitions(agent_test PRIVATE SEGTAPE_BIN="$<TARGET_FILE:segtape>")
add_dependencies(agent_test segtape)
