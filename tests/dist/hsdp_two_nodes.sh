# HSDP across two cpprun agents on this host as two nodes of 2 workers each (CPPRUN_JOB_SECRET,
# worker rank 0's store: see tests/launcher/behaviour/multi_node_collectives.sh): test_hsdp.cpp then
# meshes node_local_mesh() = {2 nodes, 2 local}, shards within a node and replicates across
# them, and must match one process at stages 1-3 and with its sharded checkpoints.
# Usage: hsdp_two_nodes.sh PATH/TO/cpprun PATH/TO/cpprun_dist_hsdp
. "$(dirname "$0")/../launcher/behaviour/common.sh"
require_private_netns
hsdp=${2:?usage: $0 PATH/TO/cpprun PATH/TO/cpprun_dist_hsdp}

# Node 0 first; node 1 once node 0's agent listens at --master_port (an event, not a race).
start_node node0 --nnodes=2 --node_rank=0 --nproc_per_node=2 --master_port=29530 "$hsdp"
node0=$NODE_PID
wait_for_listener "$node0" 29530 30
start_node node1 --nnodes=2 --node_rank=1 --nproc_per_node=2 --master_port=29530 "$hsdp"
node1=$NODE_PID
wait_node "$node0" 200
expect_eq "$NODE_STATUS" 0 "node 0's exit code"
wait_node "$node1" 200
expect_eq "$NODE_STATUS" 0 "node 1's exit code"
expect_in_file "$WORK/node0.out" "[rank0]: hsdp: mesh 2x2 (node, local)" "rank 0's mesh"
for rank in 0 1; do expect_in_file "$WORK/node0.out" "[rank$rank]: All tests passed" "rank $rank's result"; done
for rank in 2 3; do expect_in_file "$WORK/node1.out" "[rank$rank]: All tests passed" "rank $rank's result"; done
expect_no_leftovers
echo PASS
