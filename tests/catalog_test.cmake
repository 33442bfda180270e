# The bad-input catalog: one table per layer walking the public surface with
# bad input, checking error type, message, no crash and no lost file.
segtape_test(catalog_test SOURCES catalog_test.cpp LABELS errors LIBS segtape_agent)
target_compile_definitions(catalog_test PRIVATE SEGTAPE_BIN="$<TARGET_FILE:segtape>")
add_dependencies(catalog_test segtape)
