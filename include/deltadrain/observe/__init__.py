"""What an operator reads: the lifecycle counts (`status`), the notes that explain a state that is no
failure (`notes`), whether a source has work (`probe`), the SLA-like alerts (`alerts`), and the
JVM-free reads of deltadrain's tables for the view (`tables`).
"""

__all__ = ["alerts", "notes", "probe", "status", "tables"]
