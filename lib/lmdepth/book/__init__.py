"""The book: chapters as runnable units, the build, the CLI, notebook helpers, the explorer."""
