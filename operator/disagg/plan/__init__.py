"""`disagg plan`: a capacity planner on the twin's performance model (docs/planning.md)."""
