"""Test doubles shared by nightlab's tests and benchmarks.

`nightlab.testing.fake_sky.FakeSky` stands in for SkyPilot's API server and clouds (it
needs the `skypilot` package, so import it only where SkyPilot is installed).
"""
