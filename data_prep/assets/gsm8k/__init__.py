"""GSM8K original release (MIT, see LICENSE here), used when the hub is unreachable."""
