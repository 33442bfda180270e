# CUDA backend tests (ctest label `cuda`), built whenever the CUDA backend is
# (SEGTAPE_HAVE_CUDA: nvcc and cuDNN 9 found). Every test that needs a GPU
# skips itself, saying why, when none can be used; the rest run anywhere.
if(SEGTAPE_HAVE_CUDA)
  segtape_test(cuda_test SOURCES cuda_test.cpp LABELS cuda LIBS segtape_nn)  # nn::Adam in a graph segment
  target_include_directories(cuda_test PRIVATE ${PROJECT_SOURCE_DIR}/engine)  # cuda/fused_gru.h: the fused GRU's plan
  # nn, the agent Trainer and the retention lab on CUDA against the CPU.
  segtape_test(cuda_nn_test SOURCES cuda_nn_test.cpp LABELS cuda LIBS segtape_agent)
  segtape_test(cuda_device_loop_test SOURCES device_loop_test.cpp alloc_hook.cpp LABELS cuda LIBS segtape_agent)
endif()

# The same nn / agent / retention-lab device tests on the host-emulated device
# (segtape/emulation.h): built and run in every build, GPU or not, so CI runs
# the device code paths of the tape, nn and the agent (and ASan sees them).
segtape_test(emulated_device_test SOURCES cuda_nn_test.cpp LABELS emulated LIBS segtape_agent PREFIX "emulated.")
target_compile_definitions(emulated_device_test PRIVATE SEGTAPE_TEST_EMULATED_DEVICE)

# cuda_test.cpp again on the host-emulated device: the CPU halves of its
# tests (each op case's float32 conditioning on the CPU, the training
# problem's learning on the CPU) and the device code paths run in every
# build; what only the CUDA backend does skips there.
segtape_test(emulated_cuda_test SOURCES cuda_test.cpp LABELS emulated LIBS segtape_nn PREFIX "emulated.")
target_compile_definitions(emulated_cuda_test PRIVATE SEGTAPE_TEST_EMULATED_DEVICE)
target_include_directories(emulated_cuda_test PRIVATE ${PROJECT_SOURCE_DIR}/engine)
