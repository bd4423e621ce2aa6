"""Deployment outputs generated from the cluster file: `splitserve deploy supervisord`."""
