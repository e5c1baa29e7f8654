"""`sluice rollout`: a model version upgrade, shifted in steps behind a quality check and SLO gates."""
