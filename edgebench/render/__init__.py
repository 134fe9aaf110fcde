"""Pure renderers: results in, text out (JUnit XML, Markdown, HTML)."""
