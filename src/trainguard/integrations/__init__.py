"""Adapters that plug trainguard into other trainers and tools (optional extras).

- `trainguard.integrations.hf`: `GuardedTrainer` (or `GuardedTrainerMixin`), a Hugging Face
  `transformers.Trainer` guarded on every optimizer step, with its `TrainguardCallback`.
- `trainguard.integrations.lightning`: `TrainguardLightningCallback`, its
  `VerifiedModelCheckpoint` companion and `fit` (resume and rollback).
- `trainguard.integrations.verified`: the verified checkpoint folders both use.
- `trainguard.integrations.lm_eval`: a trainguard checkpoint as an lm-evaluation-harness model.
Each framework module imports its framework on import and says how to install it when missing.
"""
