// The decode phase of H2O (policies/h2o.mlir) with a budget no benchmark
// context reaches: every decode step computes the accumulated attention and
// scans for victims, but the cache keeps its length, so that the time of one
// step can be measured at a fixed context. A benchmark input: the build
// compiles it (bench/CMakeLists.txt), which parses and verifies it.

kvc.policy @h2o_decode {
  kvc.phase every_step {
    %attn = kvc.attn_accumulate decay 1.0
    %group = kvc.group_reduce mean %attn
    %score = kvc.protect %group sinks 0 recent 512 : !kvc.score<kv_head>
    %budget = kvc.budget_uniform count 1048576
    %keep = kvc.topk %score, %budget tie recent : !kvc.score<kv_head>
    kvc.evict %keep
  }
}
