package daemon

import (
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/seccompagent"
	"github.com/napitap/napitap/pkg/tapsetup"
)

// agentRegistry tells the seccomp agent which taps are napitap's: those of
// the intercept-mode attachments napitapd recorded at ADD.
func agentRegistry(srv *handoff.Server) seccompagent.Registry {
	return seccompagent.RegistryFunc(func(netnsID uint64, tapName string) (seccompagent.Target, bool) {
		att, ok := srv.Intercepted(netnsID, tapName)
		if !ok {
			return seccompagent.Target{}, false
		}
		return seccompagent.Target{
			Key: att.Key.String(), NAPI: att.NAPI, NAPIFrags: att.NAPIFrags, MultiQueue: att.MultiQueue,
			Mark: tapsetup.OwnerAlias(att.ContainerID, att.IfName),
		}, true
	})
}
