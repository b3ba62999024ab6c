"""What this machine can do and what a model needs: hardware probes, the roofline, live metrics."""
