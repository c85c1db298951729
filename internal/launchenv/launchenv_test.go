package launchenv

import (
	"errors"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestExpandHostlist(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []string
	}{
		{"node1", []string{"node1"}},
		{"node[01-04,07]", []string{"node01", "node02", "node03", "node04", "node07"}},
		{"a,b[1-2],c", []string{"a", "b1", "b2", "c"}},
		{"node[08-10]", []string{"node08", "node09", "node10"}},
		{"n[9-11]", []string{"n9", "n10", "n11"}},
		{"rack[1-2]-gpu[0-1]", []string{"rack1-gpu0", "rack1-gpu1", "rack2-gpu0", "rack2-gpu1"}},
		{"gpu[3]", []string{"gpu3"}},
		{" host-a.example.org ", []string{"host-a.example.org"}},
		{"[1-2]x", []string{"1x", "2x"}},
	} {
		got, err := ExpandHostlist(c.in)
		require.NoError(t, err, c.in)
		assert.Equal(t, c.want, got, c.in)
		first, err := FirstHost(c.in)
		require.NoError(t, err, c.in)
		assert.Equal(t, c.want[0], first, c.in)
	}
	for _, bad := range []string{"", ",", "a,,b", "node[", "node]", "node[]", "node[3-1]", "node[a-b]",
		"node[1-2", "node[[1]]", "node[1-]", "node[-1]", "n[0-99999999]", "x[0-300]y[0-300]"} {
		_, err := ExpandHostlist(bad)
		assert.ErrorIs(t, err, ErrHostlist, "%q", bad)
	}
	_, err := FirstHost("")
	assert.ErrorIs(t, err, ErrHostlist)
}

func FuzzExpandHostlist(f *testing.F) {
	for _, s := range []string{"node[01-04,07]", "a,b", "rack[1-2]-gpu[0-1]", "x[", "[]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		hosts, err := ExpandHostlist(s)
		if err != nil {
			if !errors.Is(err, ErrHostlist) {
				t.Fatalf("%q: error %v does not match ErrHostlist", s, err)
			}
			return
		}
		if len(hosts) == 0 || len(hosts) > maxHosts {
			t.Fatalf("%q: %d hosts", s, len(hosts))
		}
		first, err := FirstHost(s)
		if err != nil || first != hosts[0] {
			t.Fatalf("%q: FirstHost %q, %v; want %q", s, first, err, hosts[0])
		}
	})
}

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestFromEnv(t *testing.T) {
	for _, c := range []struct {
		name string
		env  map[string]string
		want Job
	}{
		{"none", nil, Job{WorldSize: 1}},
		{"gdistrun", map[string]string{"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
			"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
			Job{Launcher: Torchrun, Rank: 1, WorldSize: 2, LocalRank: 1, MasterAddr: "127.0.0.1", MasterPort: 29500}},
		{"torchrun two nodes", map[string]string{"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
			"MASTER_ADDR": "h0", "MASTER_PORT": "29500"},
			Job{Launcher: Torchrun, Rank: 3, WorldSize: 4, LocalRank: 1, LocalWorldSize: 2, MasterAddr: "h0", MasterPort: 29500, Multihost: true}},
		{"gdistrun one host", map[string]string{"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
			"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
			Job{Launcher: Torchrun, WorldSize: 2, LocalWorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: 29500}},
		{"torchrun store port", map[string]string{"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
			"MASTER_ADDR": "h0", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "abc"},
			Job{Launcher: Torchrun, WorldSize: 2, LocalWorldSize: 2, MasterAddr: "h0", MasterPort: 29501,
				Derived: []string{"MASTER_PORT+1 (torchrun's store holds MASTER_PORT)"}}},
		{"torchrun explicit port", map[string]string{"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "h0",
			"MASTER_PORT": "29500", "GDIST_MASTER_PORT": "31000", "TORCHELASTIC_RUN_ID": "abc"},
			Job{Launcher: Torchrun, WorldSize: 1, MasterAddr: "h0", MasterPort: 31000}},
		{"kubernetes", map[string]string{"JOB_COMPLETION_INDEX": "3", "WORLD_SIZE": "4",
			"MASTER_ADDR": "train-0.train", "MASTER_PORT": "29500"},
			Job{Launcher: Kubernetes, Rank: 3, WorldSize: 4, LocalWorldSize: 1, MasterAddr: "train-0.train", MasterPort: 29500, Multihost: true}},
		{"open mpi local", map[string]string{"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
			"OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_MCA_ess_base_jobid": "1234"},
			Job{Launcher: OpenMPI, Rank: 1, WorldSize: 2, LocalRank: 1, LocalWorldSize: 2, MasterAddr: "127.0.0.1",
				MasterPort: portFor("1234"), Derived: []string{
					"MASTER_ADDR 127.0.0.1 (OMPI_COMM_WORLD_LOCAL_SIZE=2: every rank on this host)",
					"MASTER_PORT " + itoa(portFor("1234")) + " (from OMPI_MCA_ess_base_jobid=1234)"}}},
		{"open mpi multihost", map[string]string{"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4",
			"OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "MASTER_ADDR": "h0", "MASTER_PORT": "29500"},
			Job{Launcher: OpenMPI, Rank: 2, WorldSize: 4, LocalWorldSize: 2, MasterAddr: "h0", MasterPort: 29500, Multihost: true}},
		{"mpich", map[string]string{"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2",
			"PMI_KVSNAME": "kvs_77_0"},
			Job{Launcher: PMI, WorldSize: 2, LocalWorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: portFor("kvs_77_0"),
				Derived: []string{"MASTER_ADDR 127.0.0.1 (MPI_LOCALNRANKS=2: every rank on this host)",
					"MASTER_PORT " + itoa(portFor("kvs_77_0")) + " (from PMI_KVSNAME=kvs_77_0)"}}},
		{"slurm one node", map[string]string{"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1",
			"SLURM_STEP_NODELIST": "node07", "SLURM_NNODES": "1", "SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0"},
			Job{Launcher: Slurm, Rank: 1, WorldSize: 2, LocalRank: 1, MasterAddr: "127.0.0.1", MasterPort: portFor("42.0"),
				Derived: []string{"MASTER_ADDR 127.0.0.1 (a one-node step)",
					"MASTER_PORT " + itoa(portFor("42.0")) + ` (from SLURM_JOB_ID=42, step "0")`}}},
		{"slurm multi node", map[string]string{"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
			"SLURM_STEP_NODELIST": "node[03-04,07]", "SLURM_JOB_ID": "42", "MASTER_PORT": "29400"},
			Job{Launcher: Slurm, Rank: 5, WorldSize: 8, LocalRank: 1, MasterAddr: "node03", MasterPort: 29400, Multihost: true,
				Derived: []string{"MASTER_ADDR node03 (first host of SLURM_STEP_NODELIST)"}}},
		{"rank wins over slurm", map[string]string{"RANK": "0", "WORLD_SIZE": "1", "SLURM_PROCID": "3", "SLURM_NTASKS": "4"},
			Job{Launcher: Torchrun, WorldSize: 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := FromEnv(env(c.env))
			require.NoError(t, err)
			assert.Equal(t, c.want, got)
		})
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func TestFromEnvErrors(t *testing.T) {
	for _, c := range []struct {
		env map[string]string
		bad string
	}{
		{map[string]string{"RANK": "x", "WORLD_SIZE": "2"}, "RANK"},
		{map[string]string{"RANK": "0"}, "WORLD_SIZE"},
		{map[string]string{"RANK": "2", "WORLD_SIZE": "2"}, "RANK"},
		{map[string]string{"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE"},
		{map[string]string{"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "-1"}, "LOCAL_RANK"},
		{map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "70000"}, "MASTER_PORT"},
		{map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_NODELIST": "n[1-"}, "SLURM_STEP_NODELIST"},
		{map[string]string{"JOB_COMPLETION_INDEX": "0"}, "WORLD_SIZE"},
	} {
		_, err := FromEnv(env(c.env))
		var e *Error
		require.ErrorAs(t, err, &e, "%v", c.env)
		assert.Equal(t, c.bad, e.Var, "%v", c.env)
	}
}

func TestPortFor(t *testing.T) {
	seen := map[int]bool{}
	for i := range 1000 {
		p := portFor(strconv.Itoa(i))
		assert.GreaterOrEqual(t, p, PortBase)
		assert.Less(t, p, PortBase+PortSpan)
		seen[p] = true
	}
	assert.Greater(t, len(seen), 900, "ports should spread")
	assert.Equal(t, portFor("42.0"), portFor("42.0"))
}
