"""The suite's Django app: a token-checked table and the handler the clusters run."""
