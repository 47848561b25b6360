"""The page's inline CSS and JavaScript: nothing is fetched, the folder opens offline.

Progressive enhancement: the first script adds the class ``js`` to ``<html>``; only then do the tabs,
the layer picker and the channel viewer appear and hide the views not chosen. Without JavaScript
every view stays on the page, one under another, each under its own heading, and no control shows.
"""

from __future__ import annotations

__all__ = ["CSS", "HEAD_SCRIPT", "SCRIPT"]

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1100px;
color:#222;padding:0 1rem;line-height:1.45}
h1{font-size:1.6rem;margin-bottom:.2rem}h2{border-bottom:1px solid #ddd;padding-bottom:.2rem;margin-top:2.2rem}
h3.view-title{font-size:1rem;margin:1.2rem 0 .3rem}
nav a{margin-right:1rem}figure{margin:1rem 0}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{color:#555;font-size:.9rem}pre{background:#f6f8fa;padding:.8rem;overflow-x:auto;font-size:.8rem}
table.kv td,table.kv th{padding:.15rem .8rem .15rem 0;text-align:left;vertical-align:top}
table.kv th{font-weight:600;white-space:nowrap}
table.rows{border-collapse:collapse;font-size:.85rem}table.rows th,table.rows td{padding:.15rem .6rem;
border-bottom:1px solid #eee;text-align:right}table.rows th:first-child,table.rows td:first-child{text-align:left}
table.rows tr.bad td{background:#fdecec}
.warn{color:#a40000;font-weight:600}.ok{color:#176f2c;font-weight:600}.meta{color:#555}
.banner{border:2px solid #c77700;background:#fff6e5;padding:.6rem .9rem;margin:1rem 0;border-radius:6px}
.banner strong{color:#8a4b00}
.svgbox{overflow-x:auto}svg.structure{max-width:100%;height:auto;font:12px ui-monospace,Menlo,Consolas,monospace}
svg.structure .box rect{fill:#f4f6fa;stroke:#8a99b5}svg.structure .name{font-weight:700}
svg.structure .shape{fill:#37507a}svg.structure .chip rect{fill:#fff;stroke:#c5cde0}
svg.structure .io{fill:#555}svg.structure .arrow{stroke:#8a99b5;stroke-width:1.5}svg.structure marker path{fill:#8a99b5}
.panel{display:flex;flex-wrap:wrap;gap:1rem;align-items:flex-start}
.panel img.input{width:160px;height:auto;image-rendering:auto;border:1px solid #eee}
.grid{position:relative;flex:0 1 480px;line-height:0}
.grid img{width:100%;height:auto;image-rendering:pixelated;border:1px solid #eee;box-sizing:border-box}
.grid .tl{position:absolute;font:10px/1.2 ui-monospace,monospace;color:#fff;background:rgba(0,0,0,.55);
padding:0 2px}
.legend{display:flex;align-items:center;gap:.4rem;font-size:.85rem;color:#444;margin:.3rem 0}
.legend .ramp{display:inline-block;width:160px;height:10px;border:1px solid #ccc}
.controls,.zoom{display:none}
.js .controls{display:flex;flex-wrap:wrap;gap:1rem;align-items:center;margin:.6rem 0}
.js .zoom{display:block;margin:.4rem 0}
.js .viewset>.view{display:none}.js .viewset>.view.shown{display:block}
.js .viewset>.view>h3.view-title{display:none}
.tabs{display:flex;flex-wrap:wrap;gap:.2rem}
.tabs button{font:inherit;padding:.25rem .7rem;border:1px solid #bbb;background:#f6f6f6;border-radius:4px;cursor:pointer}
.tabs button[aria-selected=true]{background:#37507a;color:#fff;border-color:#37507a}
.zoom .tile{image-rendering:pixelated;border:1px solid #ccc;background-repeat:no-repeat;margin-top:.3rem}
"""

HEAD_SCRIPT = "document.documentElement.classList.add('js');"

# Each .viewset has controls (a <select> or a row of tab buttons, each with data-axis) and views whose
# data-* attributes name their place on each axis; the view matching every control is shown.
# A .zoom shows one tile of a grid image (data-sheet) enlarged, by CSS background position.
SCRIPT = r"""
(function(){
function setup(set){
  var state={}, controls=set.querySelectorAll(':scope>.controls [data-axis]');
  function show(){
    set.querySelectorAll(':scope>.view').forEach(function(v){
      var on=Object.keys(state).every(function(k){return v.dataset[k]===state[k];});
      v.classList.toggle('shown',on);
    });
  }
  controls.forEach(function(c){
    var axis=c.dataset.axis;
    if(c.tagName==='SELECT'){
      state[axis]=c.value;
      c.addEventListener('change',function(){state[axis]=c.value;show();});
    }else{
      var buttons=c.querySelectorAll('button');
      state[axis]=buttons[0].dataset.value;
      buttons.forEach(function(b,i){
        b.setAttribute('aria-selected',i===0?'true':'false');
        b.addEventListener('click',function(){
          buttons.forEach(function(o){o.setAttribute('aria-selected',o===b?'true':'false');});
          state[axis]=b.dataset.value;show();
        });
      });
    }
  });
  show();
}
function zoom(z){
  var select=z.querySelector('select'), tile=z.querySelector('.tile'), note=z.querySelector('.tile-note');
  var g=z.dataset, cols=+g.cols, th=+g.th, tw=+g.tw, pad=+g.pad, w=+g.w, h=+g.h;
  var k=Math.max(1,Math.floor(224/Math.max(th,tw)));
  function draw(){
    var j=select.selectedIndex, y=pad+Math.floor(j/cols)*(th+pad), x=pad+(j%cols)*(tw+pad);
    tile.style.width=(tw*k)+'px';tile.style.height=(th*k)+'px';
    tile.style.backgroundImage='url("'+g.sheet+'")';
    tile.style.backgroundSize=(w*k)+'px '+(h*k)+'px';
    tile.style.backgroundPosition=(-x*k)+'px '+(-y*k)+'px';
    tile.dataset.channel=select.value;
    note.textContent=select.options[j].text;
  }
  select.addEventListener('change',draw);draw();
}
document.querySelectorAll('.viewset').forEach(setup);
document.querySelectorAll('.zoom').forEach(zoom);
})();
"""
