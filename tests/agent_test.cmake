segtape_test(agent_test SOURCES agent_test.cpp alloc_hook.cpp LABELS agent LIBS segtape_agent)
target_compile_definitions(agent_test PRIVATE SEGTAPE_BIN="$<TARGET_FILE:segtape>")
add_dependencies(agent_test segtape)
if(TARGET segtape_torch_lab)  # the lab's LibTorch module: the program loads it (Cli.RetentionLabLoadsItsLibTorchModule)
  target_compile_definitions(agent_test PRIVATE SEGTAPE_TORCH_LAB="$<TARGET_FILE:segtape_torch_lab>")
endif()

# TensorBoard event files: CRC-32C, records, read back (agent/tensorboard.h).
segtape_test(tensorboard_test SOURCES tensorboard_test.cpp LABELS agent LIBS segtape_tensorboard)
target_compile_definitions(tensorboard_test PRIVATE SEGTAPE_BIN="$<TARGET_FILE:segtape>")
add_dependencies(tensorboard_test segtape)

# Envs of one's own: the registry, the contract checks, plug-ins. The test
# loads plug-ins built from the same file (SEGTAPE_ENV_TEST_PLUGIN = 1: two
# envs, 2: no entry point, 3: registers nothing, 4: a name that is taken);
# they link no segtape library and resolve it from env_test, which exports
# its symbols (ENABLE_EXPORTS) as the segtape program does.
segtape_test(env_test SOURCES env_test.cpp LABELS agent LIBS segtape_agent)
set_target_properties(env_test PROPERTIES ENABLE_EXPORTS ON)
foreach(i 1 2 3 4)
  add_library(env_test_plugin_${i} MODULE env_test.cpp)
  target_compile_definitions(env_test_plugin_${i} PRIVATE SEGTAPE_ENV_TEST_PLUGIN=${i})
  target_link_libraries(env_test_plugin_${i} PRIVATE segtape_plugin segtape_warnings)
  target_compile_definitions(env_test PRIVATE SEGTAPE_ENV_TEST_PLUGIN_${i}="$<TARGET_FILE:env_test_plugin_${i}>")
  add_dependencies(env_test env_test_plugin_${i})
endforeach()
target_compile_definitions(env_test PRIVATE SEGTAPE_ENV_TEST_PLUGINS)

# Behaviour kept: every algorithm x history pair's checkpoint and reports
# against the recorded figures (tests/golden/checkpoints.txt).
segtape_test(golden_test SOURCES golden_test.cpp LABELS agent LIBS segtape_agent)
target_compile_definitions(golden_test PRIVATE SEGTAPE_BIN="$<TARGET_FILE:segtape>")
add_dependencies(golden_test segtape)

# Language models on a text corpus (--task lm): tests/data/shakespeare-20k.txt;
# TapeOptions::precision and --precision (precision_test.cpp).
segtape_test(lm_test SOURCES lm_test.cpp precision_test.cpp alloc_hook.cpp LABELS agent LIBS segtape_agent)

# Time series (--task series): tests/data/sunspots.csv.
segtape_test(series_test SOURCES series_test.cpp alloc_hook.cpp LABELS agent LIBS segtape_agent)
target_compile_definitions(series_test PRIVATE SEGTAPE_BIN="$<TARGET_FILE:segtape>")
add_dependencies(series_test segtape)

# Episodes cut by a time limit, bootstrapped (Env::truncations): A2C's returns by hand, A2C and PPO learning the value.
segtape_test(truncation_test SOURCES truncation_test.cpp LABELS agent LIBS segtape_agent)

# --critic separate: the value head's GRU of its own.
segtape_test(critic_test SOURCES critic_test.cpp LABELS agent LIBS segtape_agent)
segtape_test(ppo_settings_test SOURCES ppo_settings_test.cpp LABELS agent LIBS segtape_agent)

# Updates whose gradient is not finite (--nonfinite stop|skip, --max-skips).
segtape_test(nonfinite_test SOURCES nonfinite_test.cpp LABELS agent LIBS segtape_agent)

# The agent loop on the device (agent/device/): on the host-emulated device
# in every build, and on a GPU where the CUDA backend is built (cuda_test.cmake).
segtape_test(device_loop_test SOURCES device_loop_test.cpp alloc_hook.cpp LABELS emulated LIBS segtape_agent PREFIX "emulated.")
target_compile_definitions(device_loop_test PRIVATE SEGTAPE_TEST_EMULATED_DEVICE)
