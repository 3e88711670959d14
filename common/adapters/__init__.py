"""The parameter-efficient modules a client trains: LoRA, VeRA, (IA)^3 and prompts."""
