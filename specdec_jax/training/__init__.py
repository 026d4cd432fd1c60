"""Training: targets and drafters trained teacher-forced (`trainer`), drafters distilled from
their target (`distill`, `distill_data`, `distill_loss`), both run by the one loop (`loop`):
checkpoints, resume, metrics, best / final exports. docs/training.md walks through them."""
