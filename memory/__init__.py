"""Managed short-term memory for chat assistants (docs/memory.md): a reusable Django app; it never imports chatapp."""
