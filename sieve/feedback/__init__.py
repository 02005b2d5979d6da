"""Learning from users: impressions of what /search showed, click events against them (POST /feedback), and the
learner that trains CMC from them with position-bias correction (`sieve feedback learn`)."""
