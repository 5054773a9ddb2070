"""Torch collectors that calibrate simddp on a real cluster (needs the ``calibration`` extra: torch).

* :mod:`simddp_calibration.collectives` (``torchrun ... -m simddp_calibration.collectives``): collective timings.
* :mod:`simddp_calibration.compute` (``python -m simddp_calibration.compute`` or under torchrun): per-layer times.
* :mod:`simddp_calibration.ddp_step` (``torchrun ... -m simddp_calibration.ddp_step``): real DDP steps, for validation.
* :mod:`simddp_calibration.import_model`: a scenario's ``model:`` block from a torch model, no timing.
* :mod:`simddp_calibration.acceptance`: the whole CPU flow, collect -> fit -> DDP -> validate.

The files they write are :mod:`simddp.profile` models; ``simddp calibrate fit`` / ``validate`` /
``predict`` do the rest without torch. See docs/calibration.md.
"""
