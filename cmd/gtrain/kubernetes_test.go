package main

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// k8sObject is what the test reads of a Kubernetes object.
type k8sObject struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Spec struct {
		Parallelism    int    `yaml:"parallelism"`
		CompletionMode string `yaml:"completionMode"`
		Template       struct {
			Spec struct {
				Subdomain  string `yaml:"subdomain"`
				Containers []struct {
					Command      []string `yaml:"command"`
					Args         []string `yaml:"args"`
					VolumeMounts []struct {
						MountPath string `yaml:"mountPath"`
					} `yaml:"volumeMounts"`
				} `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

// TestKubernetesExample: examples/kubernetes/train.yaml is YAML whose
// Job runs a gtrain run command line that gtrain accepts, in per-node
// mode, with --nnodes its parallelism, the endpoint pod 0 of its
// headless Service, and the secret file in the mounted Secret.
func TestKubernetesExample(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "examples", "kubernetes", "train.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs := map[string]k8sObject{}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	for {
		var o k8sObject
		if err := dec.Decode(&o); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("train.yaml: %v", err)
		}
		objs[o.Kind] = o
	}
	job, svc := objs["Job"], objs["Service"]
	if job.Spec.CompletionMode != "Indexed" || len(job.Spec.Template.Spec.Containers) != 1 || svc.Metadata.Name == "" {
		t.Fatalf("train.yaml: want a Service and an Indexed Job of one container, got %+v", objs)
	}
	c := job.Spec.Template.Spec.Containers[0]
	argv := append(append([]string(nil), c.Command...), c.Args...)
	if len(argv) < 2 || argv[0] != "gtrain" || argv[1] != "run" {
		t.Fatalf("the container runs %q, want gtrain run", argv)
	}
	// Kubernetes expands $(VAR) from the container's environment.
	r := strings.NewReplacer("$(JOB_COMPLETION_INDEX)", "1", "$(RDZV_ID)", "0b7a3f1e-uid")
	for i := range argv {
		argv[i] = r.Replace(argv[i])
	}
	o := parseRun(t, new(bytes.Buffer), argv[2:]...)
	if !o.PerNode() {
		t.Errorf("gtrain %q is not per-node mode", argv[1:])
	}
	if o.NNodes != "3" || job.Spec.Parallelism != 3 {
		t.Errorf("--nnodes %q, parallelism %d: want both 3", o.NNodes, job.Spec.Parallelism)
	}
	wantEndpoint := job.Metadata.Name + "-0." + job.Spec.Template.Spec.Subdomain + ":29400"
	if o.RendezvousEndpoint != wantEndpoint || job.Spec.Template.Spec.Subdomain != svc.Metadata.Name {
		t.Errorf("--rdzv-endpoint %q, subdomain %q, service %q: want pod 0 of the service, %s",
			o.RendezvousEndpoint, job.Spec.Template.Spec.Subdomain, svc.Metadata.Name, wantEndpoint)
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		mounted = mounted || filepath.Dir(o.SecretFile) == m.MountPath
	}
	if o.SecretFile == "" || !mounted {
		t.Errorf("--rdzv-secret-file %q is not in a mounted volume", o.SecretFile)
	}
	if o.NodeRank != "1" || o.RunID != "0b7a3f1e-uid" || len(o.Command) == 0 {
		t.Errorf("--node-rank %q, --rdzv-id %q, command %q: want 1, the uid and a command", o.NodeRank, o.RunID, o.Command)
	}
	if _, _, _, err := o.CheckPerNode(); err != nil {
		t.Errorf("gtrain refuses the example's flags: %v", err)
	}
}
