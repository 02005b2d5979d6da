"""Training: candidate mining from the bi-encoder, CMC and cross-encoder trainers."""
