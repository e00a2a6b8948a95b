"""The shared stack: one NeMo Gym stack per machine and config set, leased by every env process
that asks for it, here or on other hosts (docs/shared-stacks.md; each module's job:
docs/architecture.md, "Modules").
"""
