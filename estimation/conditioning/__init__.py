"""The conditioning estimator: MCMC over the noisy measurements' conditional law
(Gibbs moves, line conditionals, convergence diagnostics) and the conditioned mechanism.
"""
