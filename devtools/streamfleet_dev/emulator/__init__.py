"""Local stand-ins for the AWS parts the system runs on; see README.md here for the map."""
