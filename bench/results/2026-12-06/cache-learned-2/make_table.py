import sys,re
# parse dev outputs into markdown rows: trace | budget | reuse | optgen | learned | lru | belady | belady-h1 | optgen-reuse
out=[]
for f in sys.argv[1:]:
    name=None; cols=None
    for line in open(f):
        line=line.rstrip()
        if not line: continue
        if line.strip().startswith('MiB'):
            cols=line.split()[1:]; continue
        parts=line.split()
        if len(parts)==1: name=parts[0].split('/')[-1].replace('.route.csv',''); continue
        vals=dict(zip(cols,[float(x) for x in parts[1:]]))
        out.append((name,parts[0],vals))
hdr=['reuse','optgen','learned','lru','belady','belady-h1']
print('| trace | MiB | '+' | '.join(hdr)+' | optgen - reuse |')
print('|---|---|'+'---|'*(len(hdr)+1))
for n,b,v in out:
    print(f'| {n} | {b} | '+' | '.join(f'{v[h]:.1f}' for h in hdr)+f' | {v["optgen"]-v["reuse"]:+.1f} |')
