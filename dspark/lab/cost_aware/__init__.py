"""The project's own extension of Algorithm 1: drafting time in Θ and the speculate-or-not decision."""
