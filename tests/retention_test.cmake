# The retention lab (agent/retention.h) and the explainer (engine/explain.h):
# exact per-step growth of every pitfall, flat high-water of every fix, the
# strict policy's errors, the explainer's attribution.
segtape_test(retention_test SOURCES retention_test.cpp LABELS retention LIBS segtape_agent)
