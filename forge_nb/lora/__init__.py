"""LoRA through peft: the trainer's adapter (`adapter`), the config check (`targets`), and how a
generator serves a refreshed adapter (`serve`). See `forge_nb.config.lora`."""
