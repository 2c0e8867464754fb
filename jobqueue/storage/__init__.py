"""Storage: tables, dialects and the queue's operations. Nothing here forks, sleeps or signals."""
