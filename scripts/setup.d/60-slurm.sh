# Slurm (controller, compute daemon, client tools) and MUNGE, its auth: the
# Slurm executor's tests start a real two-node cluster on loopback
# (internal/testutil/slurmtest). The packages' own services are not used.
need_apt slurmctld slurmd slurm-client munge
