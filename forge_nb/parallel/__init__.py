"""A sharded trainer: N procs in one torch.distributed group (`gang`), the policy wrapped with FSDP2
(`fsdp`), the model, optimizer and update of one rank (`policy`), state saved per shard (`state`), and HF
directories read and written a rank's rows at a time (`sharded_load`, `sharded_save`, `safetensors_rows`):
a rank never needs the whole model in its memory.

Plain PyTorch (no Monarch): the trainer and reference actors hold these, and a script drives them directly
(`testing.gang`, as `benchmarks/sharded_trainer.py` and `tests/parallel/test_policy.py` do). A session sets
its gang up through the mesh (`forge_nb.launch.torchrun`), which puts torchrun's variables (RANK, WORLD_SIZE,
MASTER_ADDR, ...) in each proc.
"""
