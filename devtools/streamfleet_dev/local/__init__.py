"""Running the system on one machine: local AWS-compatible servers and their set-up."""
