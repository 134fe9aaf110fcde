"""Analysis over records: a model's static cost (FLOPs, bytes), measured ceilings, the roofline floor,
fit, regression gates, history and the statistics they share. Pure where it can be."""
