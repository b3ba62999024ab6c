"""What this machine can do and what a model needs: the probes (gpus, cpu, backend, run by probe in a child),
the hardware report, the roofline, the one ceiling builder, doctor's report and decode check, live metrics
and memory."""
