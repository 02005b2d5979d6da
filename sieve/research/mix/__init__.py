"""The MixEncoder (Yang et al. 2023): model, runtime, stage (registered by sieve.research), trainer, `sieve train mix`."""
