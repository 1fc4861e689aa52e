"""The parts of the allocator; `computegroups.daemon.placement.allocator` is the public entry.

- `records`: the values handed out (placements, holdings, errors);
- `ledger`: what is in use, per GPU;
- `topo`: the machine as the objective sees it (weights, domains, twins);
- `rules`: which devices a claim may use now, and why not the others;
- `search`: the best k-subsets (every tie), by branch and bound;
- `lookahead`: what a set leaves for later (the best partition of what stays free);
- `wholes`, `shares`: whole-GPU sets, and shares or MIG devices;
- `feasible`: claims that can never fit; `explain`: words for people.
"""
