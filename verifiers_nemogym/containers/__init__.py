"""NeMo Gym's container environments (agents inside the task's container) on a stack this
package starts (docs/containers.md; each module's job: docs/architecture.md, "Modules").
"""
