"""End-to-end tests: convert fixture scripts, run them as processes, compare what they learn."""
