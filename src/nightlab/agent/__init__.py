"""Coding agents as the lab's researcher: instructions, memory and a supervisor.

- `instructions`: the fleet program and the skill file `nightlab init` writes into every lab.
- `journal`: the lab's research history, compact enough for an agent to read in one go.
- `prompt`: the state prompt a (re)started agent receives.
- `supervisor`: starts the agent CLI headless, restarts it on exit or stall, enforces limits.
"""
