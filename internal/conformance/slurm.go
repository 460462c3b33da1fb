package conformance

// CheckSlurmGres is the check an agent standing for a Slurm compute node
// adds to every report: the GPUs measured on the node against its GRES.
// Its Expected is the GRES GPU count (a decimal number), which the broker
// indexes: a job there gets the GRES, not what the node has.
const CheckSlurmGres = "slurm.gres"
