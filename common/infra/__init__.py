"""What every process shares that is no part of the method: structured logs, progress, fault
injection points for the tests, and TLS material."""
