# nn layer: modules (nn_lstm_test.cpp: LSTM and dropout), optimizers, checkpoints (alloc_hook counts heap
# allocations for the "optimizer step allocates nothing" checks).
segtape_test(nn_test SOURCES nn_test.cpp nn_lstm_test.cpp alloc_hook.cpp LABELS nn LIBS segtape_nn)
if(SEGTAPE_HAVE_TORCH)
  segtape_test(nn_parity_test WHOLE SOURCES nn_parity_test.cpp LABELS "nn;parity" LIBS segtape_nn segtape_torch)
endif()
