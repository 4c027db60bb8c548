"""Managed short-term memory for chat assistants (docs/memory.md §1-§5).

A reusable Django app: it works on OpenAI Chat Completions message dicts carrying their persisted
ids, and on summarizers it is handed. It never imports ``chatapp``.
"""
