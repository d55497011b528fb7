"""What the controller needs while a mesh runs: waiting on Monarch futures from a kernel or a thread, and on a
gang's answers (`calls`), the failures Monarch reports kept for the session (`supervision`), the sessions stopped
at interpreter exit (`lifecycle`), and what a proc said before it ended itself (`last_words`)."""
