"""Worker-side plumbing: the embedded broker's transport and worker processes."""
