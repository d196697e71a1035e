"""The bridge to the reference's own code (`python reference.py ...`): running its scripts in a
TensorFlow 1 process (launch, and process/, the scripts run there), moving weights between its
checkpoints and the port's (weights), the equality check (report) and the training-curves
experiment (curves)."""
