"""Run codes R601-R605: MoE router health and data-loader stalls (`guard/detectors/moe.py`,
`guard/detectors/loader.py`).
"""

from trainguard.codes import Code, register

_MOE_DOCS = (
    "docs/own-loop.md#watching-moe-routers-and-the-data-loader",
    "Fedus et al. 2021, Switch Transformer (capacity, aux loss)",
)


register(
    Code(
        code="R601",
        title="MoE layer drops tokens above the threshold",
        severity="warning",
        catches="An MoE layer's router sent more assignments to experts than their capacity "
        "holds: the share of dropped token-to-expert assignments (`tokens_dropped / "
        "tokens_routed` of the router statistics) stayed above `guards.moe_drop_max` for "
        "`guards.moe_patience` steps in a row. The worst layer is named.",
        why="A dropped token skips the layer's feed-forward (only the residual stream carries "
        "it): the model silently trains on less compute than its config says, and the drops "
        "concentrate on the tokens of the busiest experts.",
        fix="Raise `model.moe.capacity_factor`, raise `model.moe.aux_loss_weight` so the router "
        "balances, or use `model.moe.router=dropless`. If R603 or R602 came with it, the router "
        "has collapsed: fix that first.",
        false_positives="The first steps of a fresh router can drop a few percent; the default "
        "threshold (20%) and patience stay quiet on the clean runs of tests/test_moe_health.py.",
        references=_MOE_DOCS,
    ),
    Code(
        code="R602",
        title="MoE expert is dead (computes no tokens)",
        severity="warning",
        catches="An expert of an MoE layer computed no token for `guards.moe_dead_patience` "
        "steps in a row while its layer routed tokens. The layer and the expert are named.",
        why="A dead expert is parameters that never train: the model has less capacity than it "
        "pays for, and once the router stops picking an expert it rarely comes back.",
        fix="Raise `model.moe.aux_loss_weight` (the load-balancing loss), lower the learning "
        "rate of the router, or re-initialise the dead expert's gate row; check for R603.",
        false_positives="Tiny batches (few tokens per step) can leave an expert idle by chance "
        "for a step or two; the patience (20 steps by default) covers that.",
        references=_MOE_DOCS,
    ),
    Code(
        code="R603",
        title="MoE router collapsed onto a few experts",
        severity="error",
        catches="In an MoE layer, the top_k busiest experts computed at least "
        "`guards.moe_collapse_share` of all assignments for `guards.moe_patience` steps in a "
        "row: the router sends (nearly) every token to the same experts.",
        why="A collapsed router turns the MoE layer into one dense feed-forward (or, with "
        "capacity, into one that drops most tokens): the other experts stop training and the "
        "model's quality falls behind what its size promises.",
        fix="Roll back to a checkpoint before the collapse and raise "
        "`model.moe.aux_loss_weight` or lower the learning rate; keep the router in fp32.",
        false_positives="None known for top_k < n_experts: a healthy router spreads tokens, and "
        "the load-balancing loss keeps it doing so.",
        references=_MOE_DOCS,
    ),
    Code(
        code="R604",
        title="MoE load imbalance rising",
        severity="warning",
        catches="An MoE layer's load imbalance (the busiest expert's share of assignments times "
        "n_experts: 1 is balanced), smoothed over `guards.moe_imbalance_span` steps, rose more "
        "than `guards.moe_imbalance_rise` above its lowest value for `guards.moe_patience` "
        "steps in a row, after `guards.moe_min_steps` steps.",
        why="Rising imbalance is the early sign of router collapse and of token drops: the "
        "busiest expert gets more tokens than its capacity, the idle ones stop learning.",
        fix="Watch for R601-R603; raise `model.moe.aux_loss_weight` or lower the learning rate "
        "before the router collapses.",
        false_positives="A router that starts perfectly balanced by chance and settles at a "
        "mild, stable imbalance rises once; the rise threshold (50% of the smoothed value) is "
        "set above what the clean runs of tests/test_moe_health.py show.",
        references=_MOE_DOCS,
    ),
    Code(
        code="R605",
        title="Data loader stall: the data phase takes a large share of the step",
        severity="warning",
        catches="The data phase of the step (fetching and preparing the batch: "
        "`data_time_s`) took at least `guards.loader_share` of the step's time, as the median "
        "of the last `guards.loader_window` steps. It names the loader, not a slow rank (H202) "
        "or a slow step (R106): the compute did not slow down, the batches came late.",
        why="Accelerators wait for the input pipeline: every second the loader takes is a "
        "second of the step the model does not train, and throughput falls without any "
        "compute fault to find.",
        fix="More loader workers or prefetching, a faster store (local cache, memory-mapped "
        "shards), less work per sample in the data path (tokenize ahead: `trainguard data "
        "prepare`).",
        false_positives="Very small models whose compute takes less time than reading a batch "
        "have a large data share by nature; raise `guards.loader_share` for them.",
        references=("docs/own-loop.md#watching-moe-routers-and-the-data-loader",),
    ),
)
