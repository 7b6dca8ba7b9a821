// Package deploytest checks napitap's deployment manifests (deploy/ and the
// kind suite's test/e2e/kind/): every kustomization renders, every object
// decodes strictly into its Kubernetes type (a misspelt field fails), every
// napitap network config holds only fields napitap reads and passes its
// validation, and the DaemonSet keeps exactly the privileges it justifies.
//
// It is a module of its own so that kustomize and the Kubernetes API types
// stay out of napitap's module:
//
//	cd deploy/test && go test ./...
package deploytest
