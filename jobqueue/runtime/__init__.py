"""Runtime: the supervisor and its worker processes. The only package that forks, sleeps or signals."""
