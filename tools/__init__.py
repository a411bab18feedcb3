"""Developer tools: the docs' tables and figures from their numbers (``make_docs``) and mutation testing
(``mutation``)."""
