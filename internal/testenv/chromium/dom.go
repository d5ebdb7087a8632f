package chromium

import (
	"html"
	"regexp"
)

// Cell is one address cell of ipledger's pool page.
type Cell struct{ IP, State, Title, Href string }

var (
	cellTag = regexp.MustCompile(`<a [^>]*class="cell [^"]*"[^>]*>`)
	attrRe  = regexp.MustCompile(`([a-z-]+)="([^"]*)"`)
	section = regexp.MustCompile(`(?s)<section class="network" data-network="([^"]+)">(.*?)</section>`)
)

// PoolCells reads the pool page's grid from a DOM dump, by network.
func PoolCells(dom string) map[string][]Cell {
	out := map[string][]Cell{}
	for _, s := range section.FindAllStringSubmatch(dom, -1) {
		for _, tag := range cellTag.FindAllString(s[2], -1) {
			a := map[string]string{}
			for _, m := range attrRe.FindAllStringSubmatch(tag, -1) {
				a[m[1]] = html.UnescapeString(m[2])
			}
			out[s[1]] = append(out[s[1]], Cell{a["data-ip"], a["data-state"], a["title"], a["href"]})
		}
	}
	return out
}
