"""Machinery for forge_nb's own tests and benchmarks, not for a training run: hosts made of Linux network namespaces
on one machine (`netns_hosts`, root only), and a function run in N processes of one torch.distributed group without
a mesh (`gang`)."""
