"""The guards' parts below `guard.Guard`: decisions (`decision`), rollback through a
checkpointer (`rollback`), and the guards that span processes (`distributed.DistributedGuards`:
replica hashes H201, stragglers H202, hung ranks R301) on trainguard's gloo monitor group
(`group.MonitorGroup`). Nothing is imported here: the torch-free parts stay importable without
torch (loading a recipe imports `guard`)."""
