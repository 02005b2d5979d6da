"""Pure model code: bi-encoder, CMC, cross-encoder, plus thin tokenise/encode wrappers."""
